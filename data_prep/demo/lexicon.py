"""English word lists for the synthetic demo corpus (`data_prep.demo.sentences`).

Plain Python strings rather than data files so they ship with the package without any
package-data configuration. Every entry is lowercase a-z (plus an apostrophe where English
has one), ordinary enough that espeak-ng pronounces it from its dictionary or rules.

Notation:
  nouns: ``singular`` or ``singular:plural`` for irregular plurals; regular plurals are
    derived in `data_prep.demo.sentences` (box -> boxes, city -> cities, ...).
  verbs: ``base`` or ``base:past:participle`` for irregular verbs; a trailing ``*`` on the
    base doubles its final consonant before -ed/-ing (stop* -> stopped, stopping).
Words may appear in more than one list; the generator deduplicates.
"""

# ---------------------------------------------------------------------------------------
# Nouns
# ---------------------------------------------------------------------------------------

PEOPLE = """
man:men woman:women child:children person:people boy girl baby friend neighbor teacher
doctor nurse farmer driver pilot student lawyer artist writer singer dancer actor painter
baker butcher cook waiter waitress manager worker engineer scientist soldier sailor captain
officer guard guide judge king queen prince princess mother father sister brother aunt uncle
cousin grandmother grandfather daughter son wife:wives husband parent stranger visitor tourist
customer passenger player coach author poet musician drummer pianist photographer reporter
editor banker clerk cashier dentist surgeon chemist carpenter plumber electrician mechanic
gardener fisherman:fishermen hunter shepherd miner builder tailor barber librarian professor
mayor president minister senator governor sheriff detective thief:thieves prisoner lady
gentleman:gentlemen teenager toddler twin partner colleague boss assistant secretary volunteer
champion winner runner swimmer climber rider traveler explorer inventor designer architect
historian novelist astronaut firefighter policeman:policemen postman:postmen nephew niece
grandson granddaughter landlord tenant owner servant hero:heroes villain giant wizard witch
knight pirate sailor merchant peasant priest nun monk bishop pupil classmate roommate
housemate teammate opponent referee umpire fan audience guest host hostess chef janitor
porter usher vendor dealer buyer seller supplier client patient therapist counselor
pharmacist veterinarian economist accountant analyst programmer technician operator inspector
investigator journalist announcer presenter comedian magician juggler clown acrobat athlete
boxer wrestler golfer skier surfer cyclist jogger hiker camper sailor diver lifeguard ranger
farmhand cowboy baker nanny babysitter tutor lecturer scholar researcher student graduate
beginner expert amateur professional rookie veteran citizen resident villager neighbor
"""

ANIMALS = """
dog cat horse cow pig sheep:sheep goat chicken duck goose:geese mouse:mice rabbit fox wolf:wolves
bear deer:deer lion tiger elephant monkey donkey camel zebra giraffe kangaroo panda whale
dolphin shark frog snake turtle lizard spider bee ant butterfly eagle owl parrot pigeon crow
swan robin sparrow squirrel hamster puppy kitten pony bull calf:calves lamb ox:oxen beaver otter
raccoon hedgehog badger moose:moose seal penguin crab lobster snail worm beetle mosquito:mosquitoes
fly hawk falcon goldfish:goldfish salmon:salmon trout:trout rat bat mole toad gorilla leopard
cheetah rhino hippo buffalo:buffalo lamb mule ostrich peacock pelican seagull turkey rooster
hen gull stork heron flamingo bison:bison jaguar koala llama:llamas panther walrus:walruses
"""

THINGS = """
book pen pencil letter card map key bag box bottle cup glass plate bowl spoon knife:knives
fork chair table lamp clock watch phone camera radio computer laptop keyboard screen printer
ticket coin wallet purse umbrella hat coat jacket shirt sweater scarf:scarves glove shoe boot
sock dress skirt belt ring necklace bracelet basket bucket hammer ladder rope nail brush comb
mirror towel blanket pillow candle match envelope stamp package parcel notebook magazine
newspaper dictionary calendar photo:photos picture painting poster guitar piano violin drum
trumpet flute ball kite toy doll puzzle balloon present gift jar kettle pan pot tray jug
teapot mug napkin sponge bucket shovel rake saw drill screwdriver wrench needle thread button
zipper pocket suitcase backpack briefcase helmet mask apron uniform costume jersey cap
 tie blouse vest sandal slipper
ribbon badge medal trophy:trophies flag banner sign label note receipt invoice form folder file
envelope album diary journal novel textbook manual brochure leaflet catalog menu recipe
sketch drawing portrait statue sculpture vase frame cushion mattress curtain carpet rug
sheet quilt shelf:shelves drawer cupboard wardrobe cabinet desk bench stool sofa couch bed
crib cradle mailbox doorbell lock chain fence gate wheel tire engine battery charger cable
plug switch bulb torch flashlight lantern heater fan cooler fridge freezer stove oven toaster
blender mixer microwave dishwasher kettle faucet sink bathtub shower toilet soap shampoo
toothbrush toothpaste razor perfume lipstick lotion bandage pill tablet thermometer syringe
crutch wheelchair stroller cart wagon sled skateboard racket bat glove net goal whistle
compass telescope microscope magnifier ruler stapler eraser marker crayon
chalk paintbrush canvas easel clay paper cardboard tape glue string wire pipe tube hose
bucket barrel crate sack bundle heap pile stack tool toolbox gadget device machine robot
instrument speaker headphone microphone antenna satellite rocket parachute anchor sail oar
paddle net trap cage kennel leash collar saddle harness horseshoe whip bell horn
"""

FOOD_COUNT = """
apple banana lemon pear peach cherry grape strawberry potato:potatoes tomato:tomatoes onion
carrot cucumber pepper mushroom egg sandwich cookie cake pie biscuit muffin pizza burger
sausage pancake candy melon watermelon pineapple coconut plum apricot avocado mango:mangoes
orange lime nut peanut almond walnut olive bean pea radish turnip cabbage pumpkin
squash:squash zucchini:zucchini bagel pretzel donut cupcake croissant waffle omelet taco
noodle dumpling meatball chop steak cutlet fillet burrito sundae lollipop cracker
"""

FOOD_MASS = """
bread butter cheese milk rice soup tea coffee water juice sugar salt honey chocolate meat beef
pork pasta cereal yogurt cream jam flour oil vinegar garlic popcorn toast lemonade broccoli
spinach celery corn oatmeal porridge gravy ketchup mustard mayonnaise syrup spaghetti bacon ham
turkey lamb salmon tuna shrimp cocoa pepper cinnamon ginger parsley basil mint vanilla custard
pudding salad stew curry chili fudge caramel toffee dough batter sauce lettuce cabbage
"""

PLACES = """
kitchen garden park station library museum market hospital school office bank church bakery
restaurant hotel airport harbor beach forest river lake mountain village city farm factory
theater cinema stadium zoo bridge castle palace island valley desert field hill cave tower
shop store supermarket pharmacy prison university gym playground gallery cottage cabin barn
attic basement garage bedroom bathroom hallway balcony porch roof yard corner street road
avenue tunnel highway mall warehouse laboratory classroom lobby clinic studio apartment house
cafeteria canteen chapel cathedral temple mosque synagogue monastery courthouse embassy
parliament headquarters:headquarters college academy nursery kindergarten orchard vineyard
meadow pasture swamp marsh jungle cliff shore coast bay port pier dock marina lighthouse
campsite motel inn pub bar diner bistro arcade casino circus aquarium planetarium observatory
greenhouse shed workshop bakery laundry salon boutique bookstore florist garage
station terminal platform depot subway crossroads:crossroads intersection roundabout
square plaza fountain cemetery graveyard sanctuary stable kennel henhouse
"""

VEHICLES = """
car bus train bicycle bike boat ship plane truck taxi van motorcycle tractor helicopter
scooter ferry tram canoe yacht submarine ambulance jeep wagon carriage sleigh raft kayak
"""

ABSTRACT = """
idea plan story problem question answer reason decision mistake secret promise message joke
song poem dream memory habit lesson rule game chance choice opinion project report speech
meeting party holiday vacation trip journey adventure accident festival wedding birthday
concert contest race exam test job career price solution result surprise mystery theory
method victory battle agreement argument discussion conversation interview lecture recipe
schedule budget salary invitation apology excuse warning address appointment arrangement
assignment attempt audition award bargain bet bill bonus challenge comment complaint
compliment condition conference contract course crime debate deadline delay demand
description design detail difference direction discount discovery disease effort election
emergency error event exercise experience experiment explanation favor feeling fight goal
guess headline hobby improvement incident injury instruction interest invention issue
lie list loan loss mission movement offer order outcome payment performance
permission phrase picnic plot policy prayer prediction prize proposal purchase puzzle
quarrel rehearsal reply request rescue review reward rumor sale sentence service session
shift signal statement strategy strike success suggestion summary survey symbol
task theme threat tip topic tour tradition tragedy treaty trick trial vote wish
"""

BODY = """
hand head foot:feet tooth:teeth arm leg knee shoulder finger toe nose ear eye mouth neck back
stomach heart elbow wrist ankle thumb chin cheek forehead eyebrow lip tongue hip
"""

NATURE = """
tree flower rose leaf:leaves rock stone cloud star wave shell seed branch bush storm rainbow
puddle pond pebble boulder feather nest acorn pinecone twig
log trunk root petal thorn weed vine iceberg glacier volcano:volcanoes waterfall
stream creek brook canyon dune reef breeze thunderstorm hurricane tornado:tornadoes
blizzard sunset sunrise shadow
"""

TIME_NOUNS = """
morning afternoon evening night week weekend month year day hour minute season summer winter
spring autumn
"""

DAYS = "monday tuesday wednesday thursday friday saturday sunday"

MONTHS = "january february march april may june july august september october november december"

# Men's and women's first names that espeak-ng reads sensibly and that are not also common
# English words (no "bill", "rose", "mark", "grace"), so transcripts stay unambiguous.
NAMES = """
james john robert michael william david richard joseph thomas charles christopher daniel
matthew anthony donald steven paul andrew joshua kenneth kevin brian george edward ronald
timothy jason jeffrey ryan jacob gary nicholas eric jonathan stephen larry justin scott
brandon benjamin samuel gregory frank alexander raymond patrick jack dennis jerry tyler aaron
henry adam douglas nathan peter zachary kyle walter harold jeremy ethan carl keith roger
gerald christian terry sean arthur austin noah lawrence jesse joe bryan billy jordan albert
dylan bruce ralph roy alan wayne eugene juan louis russell vincent philip bobby johnny logan
mary patricia jennifer linda elizabeth barbara susan jessica sarah karen nancy lisa betty
margaret sandra ashley dorothy kimberly emily donna michelle carol amanda melissa deborah
stephanie rebecca sharon laura cynthia kathleen amy shirley angela helen anna brenda pamela
nicole emma samantha katherine christine debra rachel catherine carolyn janet maria heather
diane julie joyce victoria kelly christina lauren joan evelyn olivia judith megan cheryl
martha andrea frances hannah jacqueline ann gloria jean kathryn alice teresa sara janice doris
madison julia judy abigail marie denise beverly amber theresa marilyn danielle diana brittany
natalie sophia isabella charlotte lucy oliver harry oscar leo freddie archie alfie
"""

SURNAMES = """
smith johnson williams brown jones miller davis wilson anderson taylor thomas moore martin
jackson thompson white harris clark lewis robinson walker hall allen young king wright hill
scott green adams baker nelson carter mitchell roberts turner phillips campbell parker evans
edwards collins stewart morris murphy cook rogers morgan cooper peterson reed bailey bell kelly
howard ward cox richardson wood watson brooks bennett gray hughes price sanders myers ross
foster fisher butler barnes henderson coleman jenkins perry powell russell sullivan
"""

# Cities and countries espeak-ng pronounces reasonably in every English accent.
CITIES = """
london paris berlin rome madrid lisbon vienna prague warsaw dublin edinburgh glasgow
manchester liverpool oxford cambridge bristol leeds york brighton amsterdam brussels geneva
zurich munich hamburg milan venice naples florence athens stockholm oslo copenhagen helsinki
moscow istanbul cairo nairobi tokyo osaka beijing shanghai delhi mumbai sydney melbourne
auckland toronto montreal vancouver chicago boston denver dallas houston seattle phoenix
atlanta miami detroit portland nashville memphis philadelphia baltimore washington orlando
havana lima santiago
"""

COUNTRIES = """
france spain italy germany portugal ireland scotland england wales canada mexico brazil
argentina chile peru japan china india egypt kenya norway sweden finland denmark poland
greece austria switzerland belgium holland russia australia iceland morocco nigeria ghana
jamaica cuba vietnam thailand korea
"""

# ---------------------------------------------------------------------------------------
# Verbs (base forms; irregular forms and doubling marks are resolved in `VERB_FORMS`).
# ---------------------------------------------------------------------------------------

IRREGULAR_VERBS = """
arise:arose:arisen awake:awoke:awoken beat:beat:beaten become:became:become
begin*:began:begun bend:bent:bent bet*:bet:bet bind:bound:bound bite:bit:bitten
bleed:bled:bled blow:blew:blown break:broke:broken breed:bred:bred bring:brought:brought
build:built:built buy:bought:bought catch:caught:caught choose:chose:chosen come:came:come
cost:cost:cost creep:crept:crept cut*:cut:cut deal:dealt:dealt dig*:dug:dug do:did:done
draw:drew:drawn drink:drank:drunk drive:drove:driven eat:ate:eaten fall:fell:fallen
feed:fed:fed feel:felt:felt fight:fought:fought find:found:found flee:fled:fled
fly:flew:flown forbid*:forbade:forbidden forget*:forgot:forgotten forgive:forgave:forgiven
freeze:froze:frozen get*:got:gotten give:gave:given go:went:gone grind:ground:ground
grow:grew:grown hang:hung:hung have:had:had hear:heard:heard hide:hid:hidden hit*:hit:hit
hold:held:held hurt:hurt:hurt keep:kept:kept kneel:knelt:knelt know:knew:known lay:laid:laid
lead:led:led leave:left:left lend:lent:lent let*:let:let light:lit:lit lose:lost:lost
make:made:made mean:meant:meant meet:met:met pay:paid:paid put*:put:put quit*:quit:quit
read:read:read ride:rode:ridden ring:rang:rung rise:rose:risen run*:ran:run say:said:said
see:saw:seen seek:sought:sought sell:sold:sold send:sent:sent set*:set:set shake:shook:shaken
shine:shone:shone shoot:shot:shot show:showed:shown shrink:shrank:shrunk shut*:shut:shut
sing:sang:sung sink:sank:sunk sit*:sat:sat sleep:slept:slept slide:slid:slid
speak:spoke:spoken spend:spent:spent spin*:spun:spun split*:split:split spread:spread:spread
spring:sprang:sprung stand:stood:stood steal:stole:stolen stick:stuck:stuck sting:stung:stung
strike:struck:struck swear:swore:sworn sweep:swept:swept swim*:swam:swum swing:swung:swung
take:took:taken teach:taught:taught tear:tore:torn tell:told:told think:thought:thought
throw:threw:thrown understand:understood:understood wake:woke:woken wear:wore:worn
weep:wept:wept win*:won:won write:wrote:written sew:sewed:sewn
undo:undid:undone withdraw:withdrew:withdrawn overcome:overcame:overcome
mistake:mistook:mistaken upset*:upset:upset
"""

# Verbs that take a physical thing as their object ("she found the old key").
VERBS_THING = """
buy bring carry find lose drop* sell build break fix clean paint wash hide hold keep take borrow
open close fill empty move push pull lift throw catch pack unpack wrap* check count measure
weigh order deliver share collect repair replace polish fold hang cut* tear steal sew mark sign
print copy drag* grab* kick touch search want need like love hate prefer* choose return send
examine inspect test decorate drop* fetch finish forget* grab* hug* label lend mend miss notice
photograph pick place point post protect receive recognize remove rescue scratch shake spill
sort stack store study swap* tidy trade unlock lock use wrap* wipe design invent sketch
display donate exchange frame guard iron load unload organize plant polish rent rinse
scrub* sharpen shovel smash squeeze stir* sweep tie toss turn twist weave
"""

# Verbs that take a person as their object ("we visited our grandmother").
VERBS_PERSON = """
meet call help visit thank follow invite remember forget* teach trust miss greet hug* kiss
warn interview hire join ignore admire blame chase comfort congratulate disturb encourage
entertain excuse forgive guide interrupt marry notice phone praise protect recognize remind
rescue respect scare support surprise wake annoy amuse accompany advise applaud assist
bother cheer contact convince criticize defend email employ face fetch hear inform
introduce kiss lead meet mention obey pay persuade please punish question reward see serve
tease thank tickle treat understand watch welcome wave
"""

# Intransitive verbs ("the baby laughed loudly").
VERBS_INTRANSITIVE = """
sleep laugh smile arrive wait cry cough sneeze shout whisper sing dance swim* run* jump rest
relax work study play travel complain agree hesitate listen sigh wave yawn shiver sweat fall
sit* stand kneel breathe pray vote retire recover succeed fail improve exercise argue
apologize celebrate clap* blink nod* frown giggle scream stumble tremble wander shrug* jog*
whistle hum* knock snore paddle row sail skate ski surf fish hike camp cycle bow bloom
faint float glow melt vanish appear disappear grow shine sparkle rain snow freeze
"""

# Verbs of motion that combine with "to the <place>" ("they hurried to the station").
VERBS_MOTION = """
walk drive ride fly go come return hurry rush move run* travel climb sail swim* cycle jog*
march race wander crawl head walk stroll limp sprint hike wade dash drift
"""

# Verbs that take food as their object.
VERBS_FOOD = """
eat cook bake taste order share buy make fry boil serve prepare slice chop* grill roast mix
peel smell finish want like love hate prefer* bring carry deliver heat warm cool steam toast
spread sprinkle squeeze melt freeze wrap* pack store
"""

# Verbs of saying and thinking that take a that-clause ("she said that ...").
VERBS_SAY = """
say think know believe hope hear notice explain feel remember realize suspect admit* mention
discover guess doubt pretend announce claim insist imagine understand forget* promise report
argue reply whisper shout complain agree decide learn worry read write dream wish suggest
predict confirm deny estimate expect fear figure assume
"""

# Verbs that take a to-infinitive ("he decided to paint the fence").
VERBS_INFINITIVE = """
want need try decide plan* hope forget* promise refuse learn agree start begin* prefer* like
love hate offer manage expect choose wish attempt continue fail intend arrange prepare
pretend threaten hesitate remember deserve afford demand dare seem appear struggle volunteer
"""

# ---------------------------------------------------------------------------------------
# Adjectives and adverbs
# ---------------------------------------------------------------------------------------

ADJ_THING = """
big small large tiny huge heavy light long short tall wide narrow thick thin deep shallow round
square flat sharp dull smooth rough soft hard wet dry hot cold warm cool clean dirty empty
full new old broken fresh plain fancy cheap expensive simple strange ordinary famous beautiful
ugly pretty bright dark shiny wooden plastic golden woolen leather cotton rusty dusty muddy
sticky slippery fragile sturdy precious valuable useful useless rare common modern ancient
antique comfortable uncomfortable enormous delicate colorful striped spotted noisy quiet busy
crowded peaceful lovely elegant handsome neat messy tidy loose tight bent twisted torn
cracked shiny faded polished painted frozen heated damp soaked greasy fuzzy furry hairy
glossy sparkling spotless filthy gigantic miniature massive compact portable spare extra
missing hidden secret private public official local foreign national royal electric
digital mechanical automatic manual wireless handmade homemade wooden stone steel iron
brass copper glass crystal marble paper silk velvet denim rubber vintage classic trendy
stylish ugly ordinary unusual special perfect terrible awful wonderful excellent horrible
magnificent gorgeous splendid charming curious mysterious familiar unknown
important urgent dangerous safe solid hollow curved straight crooked pointed
blunt bare rotten
"""

COLORS = "red blue green yellow orange purple pink brown black white gray silver golden"

ADJ_PERSON = """
happy sad angry tired hungry thirsty busy lonely proud brave clever kind polite rude honest
friendly shy calm nervous worried excited bored curious careful careless patient gentle quiet
noisy lazy cheerful grumpy generous selfish wise foolish famous rich poor young old tall short
strong weak healthy sick sleepy anxious confident jealous grateful helpful serious funny clumsy
brilliant talented smart silly stubborn thoughtful eager sincere modest humble loyal energetic
ambitious annoyed ashamed amused awake bossy cautious charming cruel delighted
determined disappointed embarrassed enthusiastic exhausted fierce frightened furious glad
gloomy greedy guilty hopeful hopeless impatient innocent jolly keen lucky mean miserable
naughty nosy optimistic pleased puzzled relaxed relieved restless scared sensible sensitive
sleepless sneaky sorry strict surprised suspicious tense terrified thankful upset wicked
grown elderly
"""

ADJ_FOOD = """
delicious sweet sour salty bitter spicy fresh hot cold ripe crispy tasty juicy creamy stale
raw cooked baked fried boiled roasted frozen sliced chopped smoked warm tender crunchy sticky
rotten soggy bland rich healthy organic homemade
"""

ADJ_WEATHER = """
sunny cloudy rainy windy foggy snowy stormy warm cold hot cool chilly freezing humid mild
wet dry gray pleasant lovely miserable
"""

# Comparatives used by the "X is bigger than Y" template (irregular ones included).
COMPARATIVES = """
big:bigger small:smaller large:larger old:older new:newer young:younger tall:taller
short:shorter long:longer heavy:heavier light:lighter cheap:cheaper fast:faster slow:slower
strong:stronger weak:weaker happy:happier busy:busier quiet:quieter noisy:noisier
clean:cleaner dirty:dirtier warm:warmer cold:colder hot:hotter cool:cooler wide:wider
narrow:narrower deep:deeper smart:smarter kind:kinder brave:braver rich:richer poor:poorer
good:better bad:worse far:farther early:earlier late:later easy:easier hard:harder
pretty:prettier ugly:uglier tiny:tinier huge:huger soft:softer loud:louder safe:safer
"""

ADVERBS_MANNER = """
quickly slowly carefully quietly loudly suddenly finally happily sadly angrily eagerly gently
softly badly easily proudly nervously calmly politely rudely bravely patiently honestly
secretly silently tightly brightly warmly kindly cheerfully gladly fiercely firmly freely boldly
briefly clearly closely correctly deeply directly exactly gracefully hastily heavily lazily
lightly neatly openly perfectly poorly promptly properly rapidly roughly safely seriously
sharply simply smoothly steadily strictly successfully swiftly tenderly terribly wildly wisely
anxiously awkwardly beautifully blindly busily carelessly casually confidently curiously
desperately doubtfully elegantly energetically foolishly generously gratefully
helpfully hopefully innocently joyfully loosely lovingly merrily mysteriously noisily
obediently painfully playfully reluctantly sleepily sternly thoughtfully
truthfully urgently vaguely wearily
"""

ADVERBS_FREQUENCY = "often sometimes never always usually rarely seldom occasionally"

DEGREE = "very quite rather really extremely fairly pretty so incredibly terribly slightly"

# ---------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------

ONES = "zero one two three four five six seven eight nine"
TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
TENS = "twenty thirty forty fifty sixty seventy eighty ninety"
ORDINALS = """
first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth
fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth
"""
